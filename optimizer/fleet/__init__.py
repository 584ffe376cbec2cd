"""The fleet: how replicas of a configuration are arranged, measured together and deployed.

- topologies.py: devices a fleet of each measured topology needs (the report's table)
- proxy.py: nginx in front of replicas, configured, started and stopped by the tool
- together.py: N replicas behind the proxy against one alone, measured on real servers
- scaling.py: what that measurement says (efficiency and its interval), stored on the study
- manifests.py: the answer as Kubernetes manifests (a Deployment and its Service)
- capacity.py: the replicas and devices a peak load needs, from the recommended configuration's
  measured rate (the trial planned on, its re-measured mean, the SLOs it held)

Imports: config, engine, trial (the rate search), measure, workload, verdict (the recommendation),
record, errors. No optuna.
"""

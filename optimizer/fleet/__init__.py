"""The answer as a fleet an operator deploys: Kubernetes manifests (a Deployment of vLLM replicas
and the Service in front of them) built from the recommended configuration and the plan's
replica count.

Imports: nothing of the project (PyYAML only).
"""

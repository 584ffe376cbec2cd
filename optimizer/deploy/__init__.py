"""The recommended configuration as something to deploy: the `vllm serve` command and the YAML
`vllm serve --config` takes (serve.py), `best.yaml` and `pareto_front.yaml` (files.py), and
Kubernetes manifests written to a file (k8s.py). The report, the daemon's publisher and status,
and `plan --manifests` all deploy the same thing, so it lives below all of them.

Imports: config (flags, knobs), fleet (the manifests, a configuration's parallel sizes), record,
engine (the installed vLLM's version, a core list's size). No optuna, ray or aiohttp.
"""

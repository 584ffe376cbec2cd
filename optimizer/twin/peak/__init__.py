"""What a replica carries and shows at peak, from the twin: the rate it carries with the SLOs holding
(capacity.py), its tails at a planned rate and its knee (tails.py), and data-parallel engines behind
vLLM's balancer (data_parallel.py) with the sizes `plan` predicts from them (topologies.py)."""

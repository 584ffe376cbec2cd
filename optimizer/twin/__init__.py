"""A twin of a vLLM server: vLLM's own v1 scheduler stepped without a model on a simulated clock,
its KV pool sized as the server sizes it, and a step cost fitted on the operator's own runs.

It replays a study's materialized workload in seconds and answers in the replayer's names
(TTFT, TPOT, ITL, E2E, throughput, goodput, the server's /metrics view), each with the band its
validation against real runs measured. Imports: measure, config, engine (and vLLM itself).
"""

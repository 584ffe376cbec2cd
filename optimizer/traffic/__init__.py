"""Live traffic: what running vLLM servers report about the requests they serve. One read of a
`/metrics` page (exposition.py), histogram and counter arithmetic (histogram.py), the traffic
of a time window (window.py), and the two sources a window is read from: the servers' own
`/metrics` (scrape.py) and a Prometheus server's HTTP API (prometheus.py). Only reads.

Imports: errors; prometheus-client's parser; the standard library's urllib for HTTP.
"""

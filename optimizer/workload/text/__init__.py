"""The `text` scenario: real text instead of random token ids. scenario.py builds the requests
(passages asked back, open questions), corpus.py holds the passages and topics, chat_template.py
frames each prompt with the served model's own chat template before its tokenizer encodes it.

Imports: config, errors, the workload package's arrivals, base and tokens; jinja2 and tokenizers.
"""

"""The vLLM log grammar: the catalog of messages, the anatomy of a record, the per-record parse."""

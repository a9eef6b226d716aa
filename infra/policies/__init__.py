"""Upstream IAM policy documents, vendored verbatim for the chart versions the program pins."""

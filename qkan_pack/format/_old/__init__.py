"""Readers of older format versions: each turns its manifest JSON into the current form, so
one parser validates every version. Golden artifacts of each version live in tests/golden/."""

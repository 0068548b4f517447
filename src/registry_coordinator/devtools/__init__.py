"""Devtools: stand-in Registry Stack products and `coordinator demo`.

Never used by `coordinator serve`; they drive the service from outside, as a user would.
"""

"""Tests against real `coordinator serve` processes and stand-in products on loopback:
the API, calls, webhooks, auth, operator actions, the demo and the tutorial."""

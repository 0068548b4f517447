"""HTTP: the API callers and operators use, and the client the remote CLI uses.

The route table and its handlers, caller authentication and policies, admission of new
runs, operator actions, problem codes and webhook signatures. Built on `engine`.

It is larger than a room, by one: a module per family of routes (runs, admission,
connections, subjects, deliveries, webhooks, archive, probes) beside the plumbing they
share (routing, requests, problems, auth, context, operations) and the remote CLI's
client. The families would move to a package of their own before the next one comes.
"""

"""HTTP: the API callers and operators use, and the client the remote CLI uses.

The route table and its handlers, caller authentication and policies, admission of new
runs, operator actions, problem codes and webhook signatures. Built on `engine`.
"""

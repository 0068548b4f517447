"""HTTP: the API callers and operators use, and the client the remote CLI uses.

The route table (``api``) and the plumbing every handler shares: caller authentication and
policies, what a request gives and an answer is, problem codes, the handlers' context,
operator actions' decisions, webhook signatures, and the remote CLI's client. The
handlers of each family of routes are in ``routes``, the console's pages in ``console``.
Built on `engine`.
"""

"""The API's routes, a module per family: runs and their actions, admission of new runs,
connections, data subjects, result deliveries, archived runs, and the probes machines
watch. Each handler authenticates its caller first and answers a refusal as a problem
(``http.problems``); the table that names every route is ``http.api``.
"""

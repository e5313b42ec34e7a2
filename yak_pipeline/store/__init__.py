"""PostgreSQL: the embedded server, the connection pool, migrations and the queries.

SQL lives here and in ``sql/``; assets, routes and CLI commands call these functions.
"""

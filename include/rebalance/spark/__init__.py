"""Spark and Delta edges of the project: session factory and Delta table I/O.

Nothing in the planning core imports this package.
"""

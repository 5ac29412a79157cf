"""Stands in for rfc3987-syntax in the processes the tests start: importing it fails, as where it is not installed.

tests/conftest.py puts this folder first on the path of the test processes and of every process they
start. See the comment there for why: the real package costs 2.3 CPU s in every process that imports
jsonschema, and neither the app's install nor Ray's has it.
"""

raise ImportError("rfc3987_syntax is left out of the test suite's processes (tests/conftest.py says why)")

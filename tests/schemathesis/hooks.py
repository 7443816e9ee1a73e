"""Loaded by schemathesis (schemathesis.toml `hooks`) before it generates anything.

CPython before 3.11.8 / 3.12 can fail `ast.parse` with "SystemError: AST constructor
recursion depth mismatch" (python/cpython gh-106905). Hypothesis parses lambda sources only
to describe a filtered strategy in its repr, and that parse hit the bug here (pyenv 3.11.7):
schemathesis reported it as a runtime error of the run. Strategies are described without
parsing instead; what is generated and checked does not change.
"""

import sys

if sys.version_info < (3, 12):
    from hypothesis.internal import lambda_sources

    def _undescribed(f, *args, **kwargs):  # noqa: ARG001 - the signature Hypothesis calls
        return "lambda: <not described>"

    lambda_sources._lambda_description = _undescribed

"""The store's numbered SQL migrations and the JSON Schema of every --json output.

The folder sits at the top of the project and ships inside the package under this name
(pyproject.toml maps it with setuptools `package-dir`)."""

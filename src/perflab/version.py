"""perflab's version, stored in every row's environment; a leaf, so that the stages that record it need not import
the package's face (which hands on the API)."""

__version__ = "0.1.0"

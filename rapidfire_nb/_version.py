"""The package version, in a module of its own so the server extension can read it without importing the
package root (which imports the whole experiment layer)."""

__version__ = "0.1.0"

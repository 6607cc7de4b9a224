"""Stored schedules, the core side: their form, their JSON text, and their sync into a scheduler.

Re-exports nothing: import the module that defines a name.
"""

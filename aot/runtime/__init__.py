"""Modules copied verbatim into every generated package (they import only numpy and wgpu;
distributed.py, imported only when used, also torch).

The compiler imports the same files, so the interpreter and the deployed model share one
definition of parameter initialization and learning-rate schedules.
"""

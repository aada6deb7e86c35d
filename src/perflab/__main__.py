from perflab.cli import entry

entry()

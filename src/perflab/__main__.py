from perflab.cli import run

run()

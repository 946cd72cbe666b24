"""``python -m policies``: the policy and audit commands without the rest of gtm."""

from policies.cli import main

main(prog_name="python -m policies")

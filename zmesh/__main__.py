"""``python -m zmesh``: the ``zmesh`` command."""

from zmesh.cli import main

main()

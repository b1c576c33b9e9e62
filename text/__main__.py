"""``python -m text``: see ``text.cli``."""

from text.cli import main

main()

"""``python -m qkan_pack``: the same CLI as the ``qkan-pack`` console script."""

from .cli import main

if __name__ == "__main__":
    main()

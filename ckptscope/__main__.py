"""``python -m ckptscope`` is the same as the ``ckptscope`` console script."""

from ckptscope.cli import main

if __name__ == "__main__":
    main()

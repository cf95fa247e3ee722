"""`python -m ddpdoctor`."""

from ddpdoctor.cli import entry

if __name__ == "__main__":
    entry()

import logging

import pytest

# dp_accounting logs a warning for every Renyi order it drops; it is noise in test output.
logging.getLogger("absl").setLevel(logging.ERROR)


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()

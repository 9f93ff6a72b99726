"""Fixtures for the analysis tests."""

import pytest

from analysis_fixtures import tables_from_trials
from batchlab.analysis.tables import connect_tables


@pytest.fixture
def make_con():
    """``make_con(trials, extra_studies=(), definitions=None)`` -> a duckdb connection with the four views."""
    connections = []

    def build(trials, extra_studies=(), definitions=None):
        con = connect_tables(**tables_from_trials(trials, extra_studies, definitions))
        connections.append(con)
        return con

    yield build
    for con in connections:
        con.close()

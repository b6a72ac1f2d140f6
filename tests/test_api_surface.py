"""The package's own surface: its version, the API's names with their real signatures, frames to pandas."""
import inspect
from importlib.metadata import version

import polars as pl

import headforms
from headforms import api


def test_the_version_is_the_distribution_s():
    assert headforms.__version__ == version("headforms")


def test_every_api_name_is_the_function_itself_with_its_signature_and_docstring():
    for name in ("analyse", "behaviour", "cache", "connect", "describe", "heads", "plan", "report", "spectra", "sql",
                 "table"):
        function = getattr(headforms, name)
        assert function is getattr(api, name) and function.__doc__
        assert "*args" not in str(inspect.signature(function))


def test_frames_convert_to_pandas(tiny_rope_db):
    frame = headforms.sql("select layer, head, pairing from heads order by layer, head", tiny_rope_db)
    assert isinstance(frame, pl.DataFrame)
    df = frame.to_pandas()
    assert list(df.columns) == ["layer", "head", "pairing"] and df["pairing"].tolist() == frame["pairing"].to_list()

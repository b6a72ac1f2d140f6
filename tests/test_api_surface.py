"""The package's own surface: its version, the API's names with their real signatures, frames to pandas."""
import inspect
from importlib.metadata import version

import polars as pl

import headforms
from headforms import api


def test_the_version_is_the_distribution_s():
    assert headforms.__version__ == version("headforms")


def test_every_api_name_is_the_function_itself_with_its_signature_and_docstring():
    public = [name for name in headforms.__all__ if name != "__version__"]
    assert {"extract_models", "behaviour", "sql"} <= set(public) and set(public) <= set(dir(headforms))
    for name in public:
        function = getattr(headforms, name)
        assert function is getattr(api, "extract" if name == "extract_models" else name) and function.__doc__
        assert inspect.getdoc(function) == inspect.getdoc(getattr(api, function.__name__))
        if inspect.isfunction(function):
            assert "*args" not in str(inspect.signature(function))
    assert list(inspect.signature(headforms.extract_models).parameters)[:2] == ["sources", "db"]


def test_the_extract_subpackage_is_a_plain_module_beside_the_api_s_extract_models():
    """headforms.extract is the subpackage (checkpoints and layouts), not callable; extracting is extract_models."""
    import types

    import headforms.extract.sources

    assert type(headforms.extract) is types.ModuleType and not callable(headforms.extract)
    assert headforms.extract.__doc__.startswith("Checkpoints and their layouts")
    assert "open_checkpoint" in dir(headforms.extract) and "extract_models" in dir(headforms)


def test_frames_convert_to_pandas(tiny_rope_db):
    frame = headforms.sql("select layer, head, pairing from heads order by layer, head", tiny_rope_db)
    assert isinstance(frame, pl.DataFrame)
    df = frame.to_pandas()
    assert list(df.columns) == ["layer", "head", "pairing"] and df["pairing"].tolist() == frame["pairing"].to_list()

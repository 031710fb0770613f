import pytest

from pipeline.loadtest.selfcheck import trivial_server


@pytest.fixture(scope="session")
def trivial(tmp_path_factory):
    """A real tritonserver on the trivial-stream repository (no model needed): (gRPC url, metrics url)."""
    with trivial_server(tmp_path_factory.mktemp("trivial")) as urls:
        yield urls

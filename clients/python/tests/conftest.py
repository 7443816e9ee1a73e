import pytest


@pytest.fixture
def anyio_backend() -> str:
    """The async tests (``@pytest.mark.anyio``) run on asyncio, what AsyncClient uses."""
    return "asyncio"

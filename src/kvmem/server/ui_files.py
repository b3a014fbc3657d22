"""Where the browser chat page comes from: the packaged page, `--ui-dir`, or none.

The packaged page (kvmem/ui/static) is plain files, prebuilt and committed (its vendored
libraries by scripts/build-ui.sh), so serving it needs no Node.js. Besides the page it
has the files llama-server's web UI is asked for: `manifest.webmanifest` (the page's name,
icon and start URL), `sw.js` (a service worker that removes itself and the caches of a
page served earlier at this origin: the page registers none) and `/_app/version.json`
(`{"version": <the kvmem version>}`, answered by `page_router`). All are public, as the
page is. A `--ui-dir` page serves its own files only.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from kvmem import __version__
from kvmem.server.settings import ServerSettings

PACKAGED_UI = Path(__file__).resolve().parent.parent / "ui" / "static"
mimetypes.add_type("application/manifest+json", ".webmanifest")  # not in every system table


def page_router() -> APIRouter:
    """The packaged page's `/_app/version.json` (public: mounted without the key check)."""
    router = APIRouter()

    @router.get("/_app/version.json", include_in_schema=False)
    def version() -> JSONResponse:
        return JSONResponse({"version": __version__}, headers={"Cache-Control": "no-cache"})

    return router


def ui_directory(settings: ServerSettings) -> Path | None:
    """The directory served at / (None: no page)."""
    if not settings.ui:
        return None
    if settings.ui_dir is not None:
        return Path(settings.ui_dir)
    return PACKAGED_UI if (PACKAGED_UI / "index.html").is_file() else None


def ui_props(settings: ServerSettings) -> dict[str, object]:
    """The page's part of /props: whether / serves a page, and which one."""
    directory = ui_directory(settings)
    source = None if directory is None else ("--ui-dir" if settings.ui_dir else "packaged")
    return {"webui": directory is not None, "webui_source": source}

"""Where the browser chat page comes from: the packaged page, `--ui-dir`, or none.

The packaged page (kvmem/ui/static) is plain files, prebuilt and committed (its vendored
libraries by scripts/build-ui.sh), so serving it needs no Node.js.
"""

from __future__ import annotations

from pathlib import Path

from kvmem.server.settings import ServerSettings

PACKAGED_UI = Path(__file__).resolve().parent.parent / "ui" / "static"


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

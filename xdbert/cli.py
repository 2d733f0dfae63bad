"""The `xdbert` console script: switching profiles; the pipeline itself runs through `dvc repro`."""
from __future__ import annotations

from pathlib import Path

import typer

from xdbert import io
from xdbert.params import PROFILES

PROFILE_DIR = Path(__file__).parent / "profiles"

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def profile_text(name: str) -> str:
    return (PROFILE_DIR / f"{name}.yaml").read_text(encoding="utf-8")


@app.command()
def profile(
    name: str = typer.Argument(..., help="embedded (offline, CPU, minutes) or paper (hubs, GPU, the paper's sizes)"),
    params: Path = typer.Option(Path("params.yaml"), help="the params file to write"),
    force: bool = typer.Option(False, help="overwrite a params file that has edits of its own"),
) -> None:
    """Write the chosen profile's values into params.yaml; `dvc repro` then reruns what changed."""
    if name not in PROFILES:
        typer.echo(f"error: unknown profile {name!r}; allowed: {', '.join(PROFILES)}", err=True)
        raise typer.Exit(2)
    if params.exists() and not force:
        current = params.read_text(encoding="utf-8")
        if current not in {profile_text(p) for p in PROFILES}:
            typer.echo(
                f"error: {params} has edits that are in neither profile; they would be lost. "
                "Commit or copy them, then rerun with --force",
                err=True,
            )
            raise typer.Exit(2)
    io.write_text(params, profile_text(name))
    typer.echo(f"{params}: profile {name}. Run `dvc repro` (or `dvc exp run`) to rebuild what changed.")


@app.command()
def version() -> None:
    """Print the package version."""
    from importlib.metadata import version as v

    typer.echo(v("xdbert"))


if __name__ == "__main__":
    app()

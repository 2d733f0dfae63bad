"""The `xdbert` console script: switching profiles, checking params, fetching hub assets, comparing experiments;
the pipeline itself runs through `dvc repro`."""
from __future__ import annotations

from pathlib import Path

import typer

from xdbert import io, params, profiles
from xdbert.errors import PipelineError
from xdbert.params import PROFILES

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@app.command()
def profile(
    name: str = typer.Argument(..., help="embedded (offline, CPU), paper (hubs, GPU, the paper's sizes) or micro (toy sizes for tests)"),
    params_file: Path = typer.Option(Path("params.yaml"), "--params", help="the params file to write"),
    reset: bool = typer.Option(False, help="drop your changes instead of carrying them over"),
) -> None:
    """Write the chosen profile's values into params.yaml, keeping every value you changed from the old
    profile's defaults (listed as it goes); `dvc repro` then reruns what changed."""
    if name not in PROFILES:
        typer.echo(f"error: unknown profile {name!r}; allowed: {', '.join(PROFILES)}", err=True)
        raise typer.Exit(2)
    if params_file.is_dir():
        typer.echo(f"error: {params_file} is a folder; give the params file to write (params.yaml)", err=True)
        raise typer.Exit(2)
    changes: dict = {}
    if params_file.exists():
        try:
            current = params.load(params_file)
        except PipelineError as e:
            typer.echo(f"error: {' '.join(str(e).split())}; fix it (or delete {params_file}) and rerun", err=True)
            raise typer.Exit(2)
        changes, removed = profiles.user_changes(current, profiles.values(current["profile"]))
        verb = "dropped" if reset else "kept"
        for path, value in changes.items():
            typer.echo(f"{verb}: {profiles.dotted(path)} = {value!r} (changed from the {current['profile']} defaults)")
        for path in removed:
            typer.echo(f"restored: {profiles.dotted(path)} (missing from {params_file})")
        if reset:
            changes = {}
    text = profiles.render(name, changes)
    if changes:  # a change that fits the old profile may not fit the new one (a family it does not have)
        from xdbert.params_check import check

        try:
            check(params.read_yaml_text(text))
        except PipelineError as e:
            typer.echo(f"error: profile {name} with your changes: {' '.join(str(e).split())}; {params_file} is left as it "
                       f"was: undo that change, or `--reset` to drop them all", err=True)
            raise typer.Exit(2)
    try:
        io.write_text(params_file, text)
    except OSError as e:
        typer.echo(f"error: could not write {params_file} ({e.strerror or e}); give a params file in a folder you can write", err=True)
        raise typer.Exit(2)
    typer.echo(f"{params_file}: profile {name}. Run `dvc repro` (or `dvc exp run`) to rebuild what changed.")


@app.command()
def check(params_file: Path = typer.Argument(Path("params.yaml"), help="the params file to check")) -> None:
    """Run every stage's params check on PARAMS_FILE at once, writing nothing: each value, and the names one
    section gives another. What only files or the hub can tell, each stage checks when it starts."""
    from xdbert.params_check import check_file  # the settings of every stage: not paid by `xdbert profile`

    try:
        p = check_file(params_file)
    except PipelineError as e:
        typer.echo("error: " + " ".join(str(e).split()), err=True)  # one line, as a stage prints it
        raise typer.Exit(2)
    typer.echo(f"{params_file}: valid ({p['profile']} profile); every stage's params check passes")


@app.command()
def fetch(params_file: Path = typer.Argument(Path("params.yaml"), help="the params whose hub assets to fetch"),
          check: bool = typer.Option(False, "--check", help="only load every pinned asset the way its stage loads "
                                                           "it, and say in a table what passed; download and write nothing")) -> None:
    """Download every hub asset PARAMS_FILE names (models, datasets, open_clip weights) into the hub cache and
    pin each one's commit in hub.lock.json (commit it), which every stage then loads: run it where the hub
    can be reached, then copy the cache (HF_HOME) to machines without internet. Every asset is then loaded once
    the way its stage loads it (as `--check` does); a failure keeps the old hub.lock.json."""
    from xdbert.fetch import fetch as fetch_assets
    from xdbert.fetch_check import check_assets
    from xdbert.params_check import check_file

    try:
        p = check_file(params_file)
        if check:
            check_assets(p, say=typer.echo)
        else:
            fetch_assets(p, check=check_assets, say=typer.echo)
    except PipelineError as e:
        typer.echo("error: " + " ".join(str(e).split()), err=True)
        raise typer.Exit(2)


def _rehearse_help() -> str:
    from xdbert.rehearse import OVERRIDES

    keys = "; ".join(f"{k} = {v}" for k, v in OVERRIDES.items())
    return ("Run the untouched paper profile end to end, offline, against a local mirror of its hub assets: OUT "
            "becomes a git clone of this checkout with the real model ids, configs and vocabularies (random "
            "weights), small dataset slices in their real schemas, and the hand-provided inputs, then `dvc repro` "
            "runs there. Only these counts differ from the paper profile: " + keys + ".")


@app.command(help=_rehearse_help())
def rehearse(out: Path = typer.Option(..., "--out", help="a new folder: the clone, its hub cache (.hf/) and the run"),
             sizes: str = typer.Option("tiny", help="tiny: the real architectures shrunk to 2 layers of width 64 "
                                                    "under the same ids; paper: their real sizes"),
             repro: bool = typer.Option(True, help="run `dvc repro` after building the mirror")) -> None:
    from xdbert.rehearse import rehearse as run_rehearsal

    try:
        reports = run_rehearsal(out, sizes, repro, say=typer.echo)
    except PipelineError as e:
        typer.echo("error: " + " ".join(str(e).split()), err=True)
        raise typer.Exit(2)
    if repro:
        # their header says `paper` with the paper's rows beside them: say here what they are worth
        typer.echo(f"reports in {out / 'reports'} (random weights on a few examples: they show that the paper "
                   f"profile's code path runs, not the paper's numbers):")
        for path in reports:
            typer.echo(f"  {path}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def compare(ctx: typer.Context) -> None:
    """Show the experiments side by side: the params they changed and metrics/headline.json (each table's mean Δ,
    the mechanism's passing gates), through `dvc exp show --only-changed` with every other metric's column dropped
    (a thousand of them would not fit a terminal). Extra arguments go to `dvc exp show` (`--md`, `-n 5`, `--csv`)."""
    import subprocess

    from xdbert.reports.headline import exp_show_drop

    command = ["dvc", "exp", "show", "--only-changed", "--drop", exp_show_drop(params.SECTIONS), *ctx.args]
    try:
        done = subprocess.run(command)
    except FileNotFoundError:
        typer.echo("error: `dvc` is not on PATH; run xdbert compare from the environment the project is installed in "
                   "(pip install -c constraints.txt -e .)", err=True)
        raise typer.Exit(2)
    raise typer.Exit(done.returncode)


@app.command()
def version() -> None:
    """Print the package version."""
    from importlib.metadata import version as v

    typer.echo(v("xdbert"))


if __name__ == "__main__":
    app()

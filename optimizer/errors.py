"""The project's error tree: one root, each kind mapped to an exit code by the CLI.

    OptimizerError            anything this project raises on purpose
    +-- ConfigError           bad input (config file, CLI flag, model path): exit 2
    +-- StorageError          the study database cannot be opened or is not ours: exit 2
    +-- RayUnavailable        the Ray cluster named cannot be reached: exit 2

Errors from libraries (pydantic, SQLAlchemy, Ray) are converted where they enter,
with `raise ... from exc`, so the CLI prints one line naming the problem and the fix.
A trial's failure (a server that cannot start, a request that errors) is not an
exception: it is data in the trial's result.
"""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


class OptimizerError(Exception):
    """Root of every error this project raises on purpose."""

    exit_code = 1


class ConfigError(OptimizerError):
    """Bad input: the message names the field and the fix."""

    exit_code = 2


class StorageError(OptimizerError):
    """The study storage cannot be opened, or holds something that is not an Optuna study."""

    exit_code = 2


class RayUnavailable(OptimizerError):
    """The Ray cluster the user named cannot be reached."""

    exit_code = 2

"""The daemon's publisher: after each generation, the gate's decision (daemon/publish.py), and
when it clears: the `vllm serve --config` file, `/recommendation` and its metric, the webhook.
Each decision is recorded on the generation's study (`publish`); a restarted daemon serves the
latest published one again.
"""

from __future__ import annotations

import time

from optimizer.config.schema import PublishSpec, StudyConfig
from optimizer.daemon import publish


class Publisher:
    def __init__(self, spec: PublishSpec, state, console):
        self.spec, self.state, self.console = spec, state, console
        self.webhook = publish.Webhook(spec.webhook, spec.webhook_attempts, self._webhook_status) if spec.webhook else None
        self._shown: dict = {}

    def restore(self, studies: list[tuple[str, dict]], base: str) -> None:
        """`studies`: (name, user attributes) of the storage; the latest published generation of `base`."""
        found = [a[publish.ATTR] for name, a in studies
                 if isinstance(a.get(publish.ATTR), dict) and a[publish.ATTR].get("published")
                 and (name == base or name.startswith(base + "-g"))]
        if found:
            latest = max(found, key=lambda r: r.get("generation") or 0)
            self._shown = {"decision": {k: v for k, v in latest.items() if k != "recommendation"}}
            self.state.set(recommendation=latest.get("recommendation"), publish=self._shown)

    def _webhook_status(self, status: dict) -> None:
        self._shown["webhook"] = status
        self.state.set(publish=self._shown)

    def publish(self, study, cfg: StudyConfig, model: str, generation: int) -> dict:
        """Decide, publish when the gate says so, record; returns the record."""
        ok, why = publish.decide(study, cfg)
        record = {"published": ok, "reason": why, "decided_at": time.time(), "generation": generation,
                  "study": study.study_name}
        body = publish.payload(study, cfg, model, generation) if ok else None
        if body is not None:
            body["published_at"] = record["decided_at"]
            self._write(body, record)
            record["recommendation"] = body
            self.state.set(recommendation=body)
            self.console.print(f"[green]published[/] generation {generation}'s recommendation ({why}): "
                               f"{' '.join(body['flags'])}" + (f"; written to {record['path']}" if record.get("path") else ""))
            if self.webhook is not None:
                self.webhook.send(body)
        else:
            self.console.print(f"[yellow]not published[/]: generation {generation}'s recommendation: {why}")
        study.set_user_attr(publish.ATTR, record)
        self._shown = {"decision": {k: v for k, v in record.items() if k != "recommendation"},
                       **({"webhook": self.webhook.status} if self.webhook is not None else {})}
        self.state.set(publish=self._shown)
        return record

    def _write(self, body: dict, record: dict) -> None:
        if not self.spec.path:
            return
        try:
            record["path"] = str(publish.write_config(self.spec.path, body["config"]))
        except OSError as exc:
            record["path_error"] = f"{self.spec.path}: {exc.strerror or exc}; check the directory and free space"
            self.console.print(f"[red]recommendation file not written[/]: {record['path_error']}")

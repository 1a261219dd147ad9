"""Copies of the ``tiny`` test model that differ from it in their tokenizer
files only (a chat template, added tokens), for tests whose behaviour hangs
on those files."""

from __future__ import annotations

import json
import os
import shutil

from checkpoint.tiny_model import ensure_tiny_model


def tiny_with_chat_template(cache_dir: str, out_dir: str, template: str) -> str:
    """A copy of ``tiny`` (written under ``cache_dir``) in ``out_dir`` whose
    tokenizer_config.json's chat template is ``template``; its path."""
    shutil.copytree(ensure_tiny_model(cache_dir), out_dir)
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return out_dir

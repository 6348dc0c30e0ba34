# -*- coding: utf-8 -*-
# Copyright (c) k3s_gpu.nvidia contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The HelmChart manifests' tests (device plugin, GPU Operator) check them against helm-controller's schema here."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def documents(text):
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def helmchart_schema(version):
    data = json.loads((FIXTURES / "helmchart" / ("helm-controller-%s.json" % version)).read_text(encoding="utf-8"))
    assert data["helm_controller_version"] == version
    return data["openAPIV3Schema"]


def valid_helmchart(text, controller, name):
    """The one document of a rendered manifest: kube-system's HelmChart `name`, valid for that helm-controller."""
    docs = documents(text)
    assert [(d["apiVersion"], d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs] == [
        ("helm.cattle.io/v1", "HelmChart", "kube-system", name)]
    jsonschema.validate(docs[0], helmchart_schema(controller), cls=jsonschema.Draft7Validator)
    return docs[0]

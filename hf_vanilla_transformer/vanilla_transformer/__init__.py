# Copyright 2026 The hf-vanilla-transformer Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017): configuration, model and decoding
rules, laid out as a model folder of transformers (`transformers/models/<name>/`)."""

from typing import TYPE_CHECKING

from transformers.utils import _LazyModule
from transformers.utils.import_utils import define_import_structure

if TYPE_CHECKING:
    from .configuration_vanilla_transformer import *  # noqa: F403
    from .generation_vanilla_transformer import *  # noqa: F403
    from .modeling_vanilla_transformer import *  # noqa: F403
else:
    import sys

    _file = globals()["__file__"]
    sys.modules[__name__] = _LazyModule(__name__, _file, define_import_structure(_file), module_spec=__spec__)

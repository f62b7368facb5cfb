"""Answer extraction, re-exported from `rljax.data.extraction`.

Datasets parse their ground truth with the same functions the verifiers
use on completions, and data sits below rewards, so they live in data.
"""

from rljax.data.extraction import MAX_EXTRACTED_CHARS  # noqa: F401
from rljax.data.extraction import extract_boxed_all  # noqa: F401
from rljax.data.extraction import extract_last_boxed  # noqa: F401
from rljax.data.extraction import extract_answer_tag  # noqa: F401
from rljax.data.extraction import extract_gsm8k  # noqa: F401
from rljax.data.extraction import extract_answer_phrase  # noqa: F401
from rljax.data.extraction import strip_answer_decorations  # noqa: F401
from rljax.data.extraction import extract_final_answer  # noqa: F401
from rljax.data.extraction import extract_last_number  # noqa: F401

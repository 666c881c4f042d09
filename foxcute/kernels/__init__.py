"""CuTe DSL kernels. Importing this package fixes the DSL's environment before any kernel
module imports cutlass (the DSL reads it at import):

- CUTE_DSL_ARCH: sm_90a unless the caller chose. Without a GPU the DSL would silently
  target sm_100a; every kernel here is written for Hopper.
- CUTE_DSL_DUMP_DIR: where kept PTX/cubin files land (the DSL's default is the current
  directory), unless the caller chose.
"""

import os
import tempfile

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", os.path.join(tempfile.gettempdir(), "foxcute-cute-dumps"))
# The DSL does not create the folder, and with it missing `__ptx__` holds a path, not PTX.
os.makedirs(os.environ["CUTE_DSL_DUMP_DIR"], exist_ok=True)

"""Every setting's default, written once: the command line's options, the server's `ServeOptions`,
its `Engine` and the batch engine `Batch` all take theirs from here (a test checks that they agree)."""

CONTEXT = 4096  # positions a model's cache holds, at most (the model's own window where smaller)
MAX_GAMMA = 8  # the widest draft `--gamma auto` plans
REPEAT_LAST_N = 64  # the tokens llama.cpp's `repeat_penalty` reads (its default); vLLM's `repetition_penalty` reads all
DRAFT = "auto"  # the drafter: prompt lookup or the shared n-gram pool, whichever prices best before each call
MAX_BATCH = 16  # requests decoded together, one target forward a step
PROMPT_ROWS = 256  # prompt tokens a step feeds beside the other requests' decode rows
PREFIX_MIB = 1024  # memory for recent prompts' keys and values, reused by prompts that begin the same way
MAX_QUEUE = 16  # requests that may wait behind a full batch
MAX_BODY_BYTES = 1 << 20  # the largest request body the server reads
HOST, PORT = "127.0.0.1", 8000

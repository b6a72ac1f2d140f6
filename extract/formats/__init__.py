"""The files a checkpoint comes in (Hugging Face folders, GGUF, either on the hub by range), read into a Checkpoint."""

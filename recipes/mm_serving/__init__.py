"""A miniature multimodal serving path: an HTTP front that preprocesses images with torch and
hands pixel_values to a scheduler process through shared memory (or CUDA IPC), as an inference
server's tokenizer manager does. See README in docs/serving.md."""

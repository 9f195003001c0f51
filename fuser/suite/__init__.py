"""A model suite: twelve families from `transformers` (GPT-2, Llama, Mistral, Qwen2, Gemma,
Phi, GPT-NeoX, OPT, BERT, RoBERTa, T5, ViT) trained with eager, Inductor and fuser.

`python -m fuser.suite` runs it (see __main__); models.py builds the models from
configurations (random weights, no download), run.py trains one and judges its parity.
Needs `transformers` (pinned in the test extra).
"""

"""The pretrained baseline XLNet-Lite is measured against: a BERT masked LM of the same size (`bert_mlm`)."""

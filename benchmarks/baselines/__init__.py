"""The baselines XLNet-Lite is measured against: a BERT masked LM (`bert_mlm`) and TF-IDF + logistic regression (`tfidf`)."""

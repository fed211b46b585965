"""The pipeline that runs the RLHF path, from an empty folder to a report: the stage functions and
their table (stages.py), pretraining (pretrain.py), and the report and plots (report.py).
train.py drives it; lab/ runs it many times. It imports the root and options/, and nothing
below it imports it.
"""

"""_sched"""

"""proc"""

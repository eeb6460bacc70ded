"""The paper's analysis as tools that run models: measured alpha and costs (`measure`), figures
(`plots`). The formulas themselves are `specdecode.formulas`, below the decode loop."""

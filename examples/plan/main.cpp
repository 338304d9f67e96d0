#include "plan.h"

#include <exception>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
    try
    {
        return kvcache::plan::runPlanProgram(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
    }
    catch (std::exception const& error)
    {
        std::cerr << "kvcache-plan: " << error.what() << "\n";
        return 1;
    }
}
